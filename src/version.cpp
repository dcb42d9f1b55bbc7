#include "sluice/version.hpp"

#include "sluice_version.hpp"

// SLUICE_VERSION_SUFFIX is set only for the test build sluice-next.
#ifndef SLUICE_VERSION_SUFFIX
#define SLUICE_VERSION_SUFFIX ""
#endif

namespace sluice {

const char* version() { return SLUICE_VERSION SLUICE_VERSION_SUFFIX; }

}  // namespace sluice
