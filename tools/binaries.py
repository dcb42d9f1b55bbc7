"""Where the tools find the programs they run, unless told otherwise."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def default_sluice() -> str:
    """build-rel/sluice when it exists (a release build for figures), else build/sluice."""
    for d in ("build-rel", "build"):
        if (REPO / d / "sluice").exists():
            return str(REPO / d / "sluice")
    return str(REPO / "build" / "sluice")


def loadgen_next_to(sluice: str) -> str:
    """The loadgen built in the same build directory as `sluice`."""
    return str(Path(sluice).resolve().parent / "tools" / "loadgen")
