// Error log set-up: spdlog's default logger on stderr.
#pragma once

#include <string>

namespace sluice {

// Installs the default logger (stderr) at `level` ("info", "debug", ...).
void init_error_log(const std::string& level);

}  // namespace sluice
