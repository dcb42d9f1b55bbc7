"""[global] watch_config: sluice reloads when its configuration file's
content changes (docs/operations.md, "Reloading when the file changes").

The file is laid out as a Kubernetes ConfigMap volume is:

    DIR/..2024_01_01_00_00_00.000000001/sluice.toml
    DIR/..data -> ..2024_01_01_00_00_00.000000001
    DIR/sluice.toml -> ..data/sluice.toml

and updated as the kubelet does it: a new timestamped directory, a new
link `..data_tmp` pointing at it, renamed over `..data`, then the old
directory removed. Not a word is written into the file sluice opened."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
from pathlib import Path

import pytest

import harness
from fixtures import default_global
from harness import listener, upstream

RELOADED_RX = r"reload succeeded: configuration generation (\d+)"
FAILED_RX = r"reload failed, the running configuration is unchanged: (.*)"
_stamps = itertools.count(1)


class ConfigMapDir:
    """A directory laid out and updated like a ConfigMap volume."""

    def __init__(self, root: Path, name: str = "sluice.toml"):
        self.root = root
        self.name = name
        root.mkdir()
        self.current: str | None = None

    @property
    def path(self) -> Path:
        return self.root / self.name

    def publish(self, text: str) -> None:
        stamp = f"..2024_01_01_00_00_00.{next(_stamps):09d}"
        (self.root / stamp).mkdir()
        (self.root / stamp / self.name).write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(stamp, tmp)
        os.rename(tmp, self.root / "..data")  # the one atomic step
        if self.current is None:
            os.symlink(f"..data/{self.name}", self.path)
        else:
            shutil.rmtree(self.root / self.current)
        self.current = stamp


def render(s: harness.Sluice, backend, **global_) -> str:
    g = default_global(s.access_log)
    g["watch_config"] = True
    g.update(global_)
    return harness.render_config(g, [listener()], {"up": upstream(backend)})


@pytest.fixture
def watched(tmp_path, sluice, backends):
    """(sluice, ConfigMapDir, backend A, backend B): sluice started from a
    ConfigMap-like directory with watch_config = true, upstream A."""
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a)}, start=False)
    cm = ConfigMapDir(tmp_path / "configmap")
    cm.publish(render(s, a))
    s.config_path = cm.path
    s.start()
    s.log.wait_for(r"watch_config: reloading when .* changes \(watching .*configmap", timeout=5)
    assert harness.banner_of(s) == b"A"
    return s, cm, a, b


def reloads(s) -> int:
    return len(s.log.matches(RELOADED_RX))


def test_a_configmap_swap_reloads(watched):
    s, cm, a, b = watched
    cm.publish(render(s, b))
    s.log.wait_for(r"watch_config: .*sluice\.toml changed: reloading", timeout=harness.EVENT_TIMEOUT)
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    assert harness.banner_of(s) == b"B"
    # And again: the watch follows the links to the new directory.
    cm.publish(render(s, a))
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT, count=2)
    assert harness.banner_of(s) == b"A"


def test_the_same_content_does_not_reload(watched):
    s, cm, a, b = watched
    cm.publish(render(s, a))  # a swap, same bytes
    cm.publish(render(s, b))  # then a real change: the barrier
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    assert harness.banner_of(s) == b"B"
    # Given the debounce, both swaps may be seen in one check; either way
    # one reload, for the one change.
    cm.publish(render(s, b))
    cm.publish(render(s, a))
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT, count=2)
    assert harness.banner_of(s) == b"A"
    assert reloads(s) == 2, s.log.matches(RELOADED_RX)


def test_a_bad_file_keeps_the_running_configuration(watched):
    s, cm, a, b = watched
    cm.publish(render(s, b).replace("[[listener]]", "[[listener]]\nbogus_key = 1", 1))
    m = s.log.wait_for(FAILED_RX, timeout=harness.EVENT_TIMEOUT)
    # Named like SIGHUP's failure: file:line:column and the key.
    assert "sluice.toml:" in m.group(1) and "bogus_key" in m.group(1), m.group(0)
    assert harness.banner_of(s) == b"A"
    # Fixed: the next change is loaded.
    cm.publish(render(s, b))
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    assert harness.banner_of(s) == b"B"
    assert len(s.log.matches(FAILED_RX)) == 1


def test_a_burst_of_swaps_is_one_reload(watched):
    s, cm, a, b = watched
    for i in range(10):
        cm.publish(render(s, b if i % 2 == 0 else a) + f"\n# version {i}\n")
    cm.publish(render(s, b))
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    harness.wait_until(lambda: harness.banner_of(s) == b"B", what="the last version to be loaded")
    # The debounce (200 ms quiet, at most 1 s) folds a burst: far fewer
    # reloads than swaps, on a busy machine too.
    assert reloads(s) <= 4, s.log.matches(RELOADED_RX)
    print(f"\n11 swaps in a burst: {reloads(s)} reload(s)")


def test_a_plain_file_edited_in_place_or_replaced_reloads(tmp_path, sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a)}, global_={"watch_config": True})
    assert harness.banner_of(s) == b"A"
    text_b = render(s, b)
    s.config_path.write_text(text_b)  # in place
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    assert harness.banner_of(s) == b"B"
    tmp = s.config_path.with_suffix(".tmp")
    tmp.write_text(render(s, a))
    os.rename(tmp, s.config_path)  # an editor's atomic save
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT, count=2)
    assert harness.banner_of(s) == b"A"


def test_a_reload_can_turn_the_watch_off(watched):
    s, cm, a, b = watched
    cm.publish(render(s, b, watch_config=False))
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT)
    s.log.wait_for(r"watch_config: no longer watching", timeout=5)
    assert harness.banner_of(s) == b"B"
    # Off now: a change waits for SIGHUP.
    cm.publish(render(s, a, watch_config=False))
    s.signal(signal.SIGHUP)
    s.log.wait_for(r"received SIGHUP: reloading", timeout=5)
    s.log.wait_for(RELOADED_RX, timeout=harness.EVENT_TIMEOUT, count=2)
    assert harness.banner_of(s) == b"A"
    assert len(s.log.matches(r"watch_config: .* changed: reloading")) == 1
