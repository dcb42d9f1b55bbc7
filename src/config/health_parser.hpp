// [upstream.NAME.health]: active health check settings.
#pragma once

#include <string>

#include <toml++/toml.h>

#include "sluice/config.hpp"

namespace sluice::config_detail {

// Validates one health table. `context` names it in messages, e.g.
// `upstream "pg" health`. Keys that belong to another check type are errors
// that name the key and both types. Throws ConfigError.
// Does the check look for a role (a database check with a role other than "any")?
bool has_role(const HealthConfig& h);

HealthConfig parse_health(const toml::table& table, const std::string& context, const std::string& path);

}  // namespace sluice::config_detail
