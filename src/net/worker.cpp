#include "net/worker.hpp"

#include <spdlog/spdlog.h>

#include "net/runtime.hpp"
#include "proxy/session.hpp"

namespace sluice {

Worker::Worker(unsigned id, std::shared_ptr<Runtime> runtime, std::vector<int> fds)
    : id_(id), runtime_(std::move(runtime)), fds_(std::move(fds)) {
  uv_loop_init(&loop_);
  // Everything is set up here, before the thread exists; the thread only runs
  // the loop. request_stop() may be called as soon as the constructor returns.
  uv_async_init(&loop_, &stop_async_, on_async);
  stop_async_.data = this;
  uv_timer_init(&loop_, &shutdown_timer_);
  shutdown_timer_.data = this;
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    auto lh = std::make_unique<ListenerHandle>();
    lh->worker = this;
    lh->index = i;
    uv_tcp_init(&loop_, &lh->tcp);
    lh->tcp.data = lh.get();
    int r = uv_tcp_open(&lh->tcp, fds_[i]);
    if (r == 0) {
      r = uv_listen(reinterpret_cast<uv_stream_t*>(&lh->tcp),
                    static_cast<int>(runtime_->listeners[i].config->backlog), on_connection);
    }
    if (r < 0) {
      spdlog::error("worker {}: listener \"{}\": {}", id_, runtime_->listeners[i].config->name, uv_strerror(r));
    }
    listeners_.push_back(std::move(lh));
  }
}

Worker::~Worker() { join(); }

void Worker::start() {
  thread_ = std::thread([this] { run(); });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::request_stop() { uv_async_send(&stop_async_); }

void Worker::run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle has been closed by now; a non-zero result would mean a leak.
  if (int r = uv_loop_close(&loop_); r != 0) {
    spdlog::error("worker {}: loop closed with live handles: {}", id_, uv_strerror(r));
  }
}

void Worker::on_connection(uv_stream_t* server, int status) {
  auto* lh = static_cast<ListenerHandle*>(server->data);
  Worker* w = lh->worker;
  if (status < 0) {
    spdlog::warn("listener \"{}\": accept error: {}", w->runtime_->listeners[lh->index].config->name,
                 uv_strerror(status));
    return;
  }
  Session::accept(*w, w->runtime_->listeners[lh->index], server);
}

void Worker::link(Session* s) {
  s->next = sessions_;
  if (sessions_) sessions_->prev = s;
  sessions_ = s;
  ++session_count_;
}

void Worker::unlink(Session* s) {
  if (s->prev) s->prev->next = s->next;
  if (s->next) s->next->prev = s->prev;
  if (sessions_ == s) sessions_ = s->next;
  s->prev = s->next = nullptr;
  --session_count_;
  maybe_finish_stop();
}

void Worker::on_async(uv_async_t* a) { static_cast<Worker*>(a->data)->begin_stop(); }

void Worker::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  for (auto& lh : listeners_) uv_close(reinterpret_cast<uv_handle_t*>(&lh->tcp), nullptr);
  if (session_count_ > 0) {
    spdlog::info("worker {}: stopped accepting; waiting for {} session(s)", id_, session_count_);
    auto ms = static_cast<std::uint64_t>(runtime_->config->global.shutdown_timeout.count());
    uv_timer_start(&shutdown_timer_, on_shutdown_timer, ms, 0);
  }
  maybe_finish_stop();
}

void Worker::on_shutdown_timer(uv_timer_t* t) {
  auto* w = static_cast<Worker*>(t->data);
  spdlog::info("worker {}: shutdown_timeout reached; closing {} session(s)", w->id_, w->session_count_);
  // Sessions unlink themselves only from close callbacks, later: iterating is safe.
  for (Session* s = w->sessions_; s != nullptr; s = s->next) s->terminate(Cause::shutdown);
}

void Worker::maybe_finish_stop() {
  if (stopping_ && session_count_ == 0) close_all();
}

void Worker::close_all() {
  if (closed_) return;
  closed_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_async_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&shutdown_timer_), nullptr);
}

}  // namespace sluice
