// The version this build reports (--version, /status, the start-up line,
// the build_info metric and the upgrade hello). A function, not the macro
// itself, so that one set of module libraries can be linked into two
// programs that say different versions: the upgrade tests install a
// second build under another version string over the running one, as a
// package upgrade would (meson.build, sluice-next).
#pragma once

namespace sluice {

const char* version();

}  // namespace sluice
