#include "health/stream_probe.hpp"

#include <utility>
#include <vector>

#include "preread/proxy_protocol.hpp"

namespace sluice::health {

void StreamProbe::begin() {
  header_pending_ = false;
  conn_ = handles_.add(new Conn(this));
  uv_tcp_init(loop_, &conn_->uv);
  conn_->connect.data = conn_;
  conn_->write.data = conn_;
  const int rc = uv_tcp_connect(&conn_->connect, &conn_->uv, reinterpret_cast<const sockaddr*>(&target_.addr),
                                &StreamProbe::on_connect);
  if (rc < 0) finish(failed_with(rc), connect_reason(rc));
}

void StreamProbe::abort() {
  HandleTracker::close(conn_);
  conn_ = nullptr;
}

void StreamProbe::send(std::string bytes) {
  if (conn_ == nullptr) return;
  conn_->out = std::move(bytes);
  uv_buf_t buf = uv_buf_init(conn_->out.data(), static_cast<unsigned>(conn_->out.size()));
  const int rc = uv_write(&conn_->write, reinterpret_cast<uv_stream_t*>(&conn_->uv), &buf, 1, &StreamProbe::on_write);
  if (rc < 0) finish(false, std::string("write failed: ") + uv_strerror(rc));
}

void StreamProbe::on_connect(uv_connect_t* req, int status) {
  // Requests finish before their handle's close callback, so the record is alive.
  StreamProbe* self = live(static_cast<Conn*>(req->data));
  if (self == nullptr) return;
  if (status < 0) {
    self->finish(failed_with(status), connect_reason(status));
    return;
  }
  const int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&self->conn_->uv), &StreamProbe::on_alloc,
                               &StreamProbe::on_read);
  if (rc < 0) {
    self->finish(false, uv_strerror(rc));
    return;
  }
  if (self->config().send_proxy != ProxyProtocol::none) {
    self->send_proxy_header();
    return;
  }
  self->on_connected();
}

void StreamProbe::send_proxy_header() {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  int len = sizeof local;
  uv_tcp_getsockname(&conn_->uv, reinterpret_cast<sockaddr*>(&local), &len);
  len = sizeof peer;
  uv_tcp_getpeername(&conn_->uv, reinterpret_cast<sockaddr*>(&peer), &len);
  std::vector<std::uint8_t> header;
  const auto* src = reinterpret_cast<const sockaddr*>(&local);
  const auto* dst = reinterpret_cast<const sockaddr*>(&peer);
  if (config().send_proxy == ProxyProtocol::v1) {
    preread::append_v1(header, src, dst);
  } else {
    preread::append_v2(header, src, dst, {}, {});
  }
  header_pending_ = true;
  send(std::string(header.begin(), header.end()));
}

void StreamProbe::on_write(uv_write_t* req, int status) {
  StreamProbe* self = live(static_cast<Conn*>(req->data));
  if (self == nullptr) return;
  if (status < 0) {
    self->finish(false, std::string("write failed: ") + uv_strerror(status));
    return;
  }
  if (self->header_pending_) {
    self->header_pending_ = false;
    self->on_connected();
    return;
  }
  self->on_sent();
}

void StreamProbe::on_alloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) {
  Conn* c = Conn::from(h);
  *buf = uv_buf_init(c->in, sizeof c->in);
}

void StreamProbe::on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  StreamProbe* self = live(Conn::from(reinterpret_cast<uv_handle_t*>(s)));
  if (self == nullptr || nread == 0) return;  // 0 is EAGAIN
  if (nread > 0) {
    self->on_data(std::string_view(buf->base, static_cast<std::size_t>(nread)));
  } else if (nread == UV_EOF) {
    self->on_end({});
  } else {
    self->on_end(uv_strerror(static_cast<int>(nread)));
  }
}

}  // namespace sluice::health
