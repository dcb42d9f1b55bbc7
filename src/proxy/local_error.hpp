// Errors by origin (see sluice/local_error.hpp), and the rate-limited
// warning the data path reports them with.
#pragma once

#include "log/rate_limited_warning.hpp"
#include "sluice/local_error.hpp"
