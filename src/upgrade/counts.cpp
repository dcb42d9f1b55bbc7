#include "upgrade/counts.hpp"

namespace sluice::upgrade {

namespace {

constexpr std::size_t kFieldsPerFigure = 5;
// Payload bytes after which a message is sent (a datagram holds 64 KiB).
constexpr std::size_t kBatchBytes = 32 * 1024;

}  // namespace

std::string Figure::key() const {
  std::string k;
  for (const std::string* part : {&scope, &name, &sub, &counter}) {
    k += std::to_string(part->size());
    k += ':';
    k += *part;
  }
  return k;
}

FigureKind figure_kind(std::string_view counter) {
  if (counter == "active" || counter == "open" || counter == "connections") return FigureKind::gauge;
  if (counter.substr(0, 4) == "peak") return FigureKind::peak;
  return FigureKind::total;
}

std::vector<Message> counts_messages(const std::vector<Figure>& figures) {
  std::vector<Message> out;
  Message m;
  m.kind = Kind::counts;
  std::size_t bytes = 0;
  for (const Figure& f : figures) {
    for (const std::string* part : {&f.scope, &f.name, &f.sub, &f.counter}) {
      m.fields.push_back(*part);
      bytes += 4 + part->size();
    }
    m.fields.push_back(field(f.value));
    bytes += 4 + m.fields.back().size();
    if (bytes >= kBatchBytes) {
      out.push_back(std::move(m));
      m = Message{};
      m.kind = Kind::counts;
      bytes = 0;
    }
  }
  if (!m.fields.empty()) out.push_back(std::move(m));
  return out;
}

bool read_counts(const Message& m, std::vector<Figure>& out) {
  if (m.kind != Kind::counts || m.fields.size() % kFieldsPerFigure != 0) return false;
  std::vector<Figure> got;
  for (std::size_t i = 0; i < m.fields.size(); i += kFieldsPerFigure) {
    Figure f{m.fields[i], m.fields[i + 1], m.fields[i + 2], m.fields[i + 3], 0};
    if (f.scope.empty() || f.counter.empty() || !parse_number(m.fields[i + 4], f.value)) return false;
    got.push_back(std::move(f));
  }
  out.insert(out.end(), got.begin(), got.end());
  return true;
}

std::vector<Figure> Tally::changed(const std::vector<Figure>& now) {
  std::vector<Figure> out;
  std::map<std::string, Figure> seen;
  for (const Figure& f : now) {
    std::string k = f.key();
    auto it = last_.find(k);
    const std::uint64_t was = it != last_.end() ? it->second.value : 0;
    if (f.value != was) out.push_back(f);
    seen.emplace(std::move(k), f);
  }
  for (const auto& [k, f] : last_) {
    if (f.value != 0 && !seen.count(k)) {
      Figure gone = f;
      gone.value = 0;
      out.push_back(gone);
    }
  }
  last_ = std::move(seen);
  return out;
}

std::int64_t Tally::update(const Figure& f) {
  Figure& slot = last_[f.key()];
  const std::uint64_t was = slot.counter.empty() ? 0 : slot.value;
  slot = f;
  return static_cast<std::int64_t>(f.value) - static_cast<std::int64_t>(was);
}

std::uint64_t Tally::last(const Figure& f) const {
  auto it = last_.find(f.key());
  return it != last_.end() ? it->second.value : 0;
}

std::vector<Figure> Tally::figures() const {
  std::vector<Figure> out;
  for (const auto& [k, f] : last_) {
    if (f.value != 0) out.push_back(f);
  }
  return out;
}

}  // namespace sluice::upgrade
