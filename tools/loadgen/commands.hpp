// Entry points of the loadgen subcommands. Each returns the process exit code.
#pragma once

#include "options.hpp"

namespace loadgen {

int run_serve(const Options& opts);
int run_conn(const Options& opts);
int run_rr(const Options& opts);
int run_bulk(const Options& opts);
int run_idle(const Options& opts);
int run_tls(const Options& opts);
int run_integrity(const Options& opts);
int run_open(const Options& opts);

}  // namespace loadgen
