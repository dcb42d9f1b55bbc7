#include "health/send_expect_probe.hpp"

#include "health/match.hpp"

namespace sluice::health {

void SendExpectProbe::on_connected() {
  reply_.clear();
  if (!config_.send.empty()) {
    send(config_.send);
  } else if (config_.expect.empty()) {
    finish(true, "connected");
  }
}

void SendExpectProbe::on_sent() {
  if (config_.expect.empty()) finish(true, "sent " + std::to_string(config_.send.size()) + " bytes");
}

void SendExpectProbe::on_data(std::string_view bytes) {
  if (config_.expect.empty()) return;
  const std::size_t room = kMaxReplyBytes - reply_.size();
  reply_.append(bytes.substr(0, room));
  switch (match_expect(reply_, config_.expect, config_.expect_match)) {
    case Expect::matched: finish(true, "reply matched"); return;
    case Expect::mismatch: finish(false, "unexpected reply " + quote_bytes(reply_)); return;
    case Expect::need_more: break;
  }
  if (reply_.size() >= kMaxReplyBytes) finish(false, "expected reply not in the first 64 KiB");
}

void SendExpectProbe::on_end(std::string_view error) {
  if (!error.empty()) {
    finish(false, std::string(error));
  } else if (reply_.empty()) {
    finish(false, "connection closed without a reply");
  } else {
    finish(false, "unexpected reply " + quote_bytes(reply_));
  }
}

}  // namespace sluice::health
