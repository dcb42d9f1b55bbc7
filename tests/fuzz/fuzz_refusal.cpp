// libFuzzer target for the reader of a refused client's first message
// (preread/refusal.hpp), used the way the session uses it: the client's
// bytes arrive in pieces. The first input byte picks the protocol and the
// cut; the rest is what the client sends.
//
// Invariants: what is sent does not depend on how the bytes were cut;
// what is sent is only PostgreSQL's 'N' (at most two) and the one fixed
// reply (never a byte of the input); a reader that is done stays done and
// sends nothing more; and it is done within its bound of input (10 000
// bytes for PostgreSQL, 64 KiB for Redis).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "preread/refusal.hpp"

using sluice::Cause;
using sluice::ClientProtocol;
using sluice::preread::Refusal;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

struct Outcome {
  std::string sent;
  bool done = false;
  std::size_t fed_when_done = 0;
};

Outcome run(ClientProtocol protocol, std::span<const std::uint8_t> input, std::size_t cut) {
  Refusal r(protocol, Cause::no_server, "pg");
  Outcome o;
  std::size_t fed = 0;
  auto feed = [&](std::span<const std::uint8_t> piece) {
    const Refusal::Step s = r.feed(piece);
    fed += piece.size();
    if (o.done) {
      check(s.status == Refusal::Status::done && s.send.empty());
      return;
    }
    o.sent += s.send;
    if (s.status == Refusal::Status::done) {
      o.done = true;
      o.fed_when_done = fed;
    }
  };
  feed({});
  feed(input.first(cut));
  feed(input.subspan(cut));
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const ClientProtocol protocols[] = {ClientProtocol::postgres, ClientProtocol::redis, ClientProtocol::mysql};
  const ClientProtocol protocol = protocols[data[0] % 3];
  const std::span<const std::uint8_t> input(data + 1, size - 1);
  const std::size_t cut = input.empty() ? 0 : (data[0] / 3) % (input.size() + 1);
  const Outcome whole = run(protocol, input, input.size());
  const Outcome two = run(protocol, input, cut);
  check(whole.sent == two.sent && whole.done == two.done);
  const std::string reply = Refusal(protocol, Cause::no_server, "pg").reply();
  // 'N' at most twice, then the reply or nothing.
  std::size_t n = 0;
  while (n < whole.sent.size() && n < 2 && whole.sent[n] == 'N') ++n;
  const std::string rest = whole.sent.substr(n);
  check(rest.empty() || rest == reply);
  if (protocol != ClientProtocol::postgres) check(n == 0 || rest == reply);
  if (protocol == ClientProtocol::mysql) check(whole.done && (whole.sent == reply || whole.sent.empty()));
  // Bounded: a reader not done has not been given its limit yet.
  if (!whole.done) {
    if (protocol == ClientProtocol::postgres) check(input.size() < Refusal::kMaxPgStartup + 8 * 2);
    if (protocol == ClientProtocol::redis) check(input.size() < Refusal::kMaxRedisCommand);
  }
  return 0;
}
