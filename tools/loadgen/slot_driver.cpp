#include "slot_driver.hpp"

#include <cstdio>
#include <string>

namespace loadgen {

std::optional<SlotOptions> slot_options(const Options& opts, const char* cmd,
                                        std::uint64_t default_concurrency, const SizeOption& size) {
  SlotOptions out;
  out.duration = opts.seconds("duration", 10.0);
  out.concurrency = opts.count("concurrency", default_concurrency);
  out.size = opts.count(size.name, size.fallback);
  if (out.concurrency < 1 || out.concurrency > 10000 || out.size < 1 || out.size > size.max) {
    std::fprintf(stderr, "loadgen %s: --concurrency 1..10000, --%s 1..%s\n", cmd, size.name, size.max_text);
    return std::nullopt;
  }
  return out;
}

int report_slot_load(const char* name, SlotLoad& load, std::uint64_t concurrency, double elapsed,
                     const char* ops_key, const std::function<void(JsonLine&)>& own_fields) {
  JsonLine line;
  line.add("load", std::string(name)).add("target", load.target.text);
  line.add("concurrency", concurrency);
  own_fields(line);
  line.add(ops_key, load.ops).add("rate", static_cast<double>(load.ops) / elapsed);
  line.add("p50_us", load.latency.percentile_us(50)).add("p99_us", load.latency.percentile_us(99));
  add_common(line, elapsed, load.errors);
  line.print();
  return load.ops > 0 ? 0 : 1;
}

}  // namespace loadgen
