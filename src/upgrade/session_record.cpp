#include "upgrade/session_record.hpp"

namespace sluice::upgrade {

namespace {
constexpr std::size_t kFields = 18;
}  // namespace

Message SessionRecord::to_message(int client_fd, int server_fd, int pending_fd) const {
  Message m;
  m.kind = Kind::session;
  m.fields = {field(worker),     field(seq),        listener,       upstream,        origin_upstream, server_identity,
              peer,              destination,       sni,            alpn,            field(bytes_in), field(bytes_out),
              field(age_ms),     field(connect_ms), field(idle_ms), field(tries),    field(pending_in),
              field(pending_out)};
  m.fds = {client_fd, server_fd};
  if (pending_fd >= 0) m.fds.push_back(pending_fd);
  return m;
}

bool SessionRecord::from_message(const Message& m, SessionRecord& out) {
  if (m.kind != Kind::session || m.fields.size() != kFields || m.fds.size() < 2) return false;
  const auto& all = m.fields;
  if (!parse_number(all[0], out.worker) || !parse_number(all[1], out.seq)) return false;
  const std::string* f = all.data() + 2;
  out.listener = f[0];
  out.upstream = f[1];
  out.origin_upstream = f[2];
  out.server_identity = f[3];
  out.peer = f[4];
  out.destination = f[5];
  out.sni = f[6];
  out.alpn = f[7];
  out.bytes_in = number(f[8]);
  out.bytes_out = number(f[9]);
  out.age_ms = number(f[10]);
  out.connect_ms = number(f[11]);
  out.idle_ms = number(f[12]);
  out.tries = number(f[13]);
  out.pending_in = number(f[14]);
  out.pending_out = number(f[15]);
  // The memory file is there exactly when bytes are pending.
  return m.fds.size() == (out.pending_in + out.pending_out > 0 ? 3u : 2u);
}

Message session_answer(Kind kind, std::uint64_t worker, std::uint64_t seq, std::string_view why) {
  Message m;
  m.kind = kind;
  m.fields = {field(worker), field(seq)};
  if (!why.empty()) m.fields.emplace_back(why);
  return m;
}

bool read_session_answer(const Message& m, std::uint64_t& worker, std::uint64_t& seq) {
  if ((m.kind != Kind::adopted && m.kind != Kind::declined) || m.fields.size() < 2) return false;
  return parse_number(m.fields[0], worker) && parse_number(m.fields[1], seq);
}

}  // namespace sluice::upgrade
