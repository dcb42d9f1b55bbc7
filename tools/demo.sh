#!/usr/bin/env bash
# Sets up, builds and runs sluice on conf/sluice.toml in front of three demo
# backends it starts itself (127.0.0.1:9101-9103). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --build   # only what building and running needs; tools/test.sh adds the rest
echo "building..."
tools/build.sh build-demo -Dbuildtype=release -Dtests=false -Dtools=false -Dunity=on -Dunity_size=8
/usr/bin/python3 tools/demo_backends.py 9101 9102 9103 &
backends=$!
trap 'kill "$backends" 2>/dev/null || true' EXIT
cat <<MSG

sluice is starting on conf/sluice.toml:
  least_conn  listener "demo"     127.0.0.1:7000  ->  9101 (weight 2), 9102, 9103 (backup)
  round_robin listener "demo_rr"  127.0.0.1:7001  ->  9101, 9102
Try, in another terminal:   echo hi | nc -q1 127.0.0.1 7000
        or:                 python3 -c 'import socket; s=socket.create_connection(("127.0.0.1",7000)); print(s.recv(100))'
Status page: http://127.0.0.1:9090/   metrics: curl -s 127.0.0.1:9090/metrics
Drain a server: curl -X POST 127.0.0.1:9090/upstreams/demo/servers/127.0.0.1:9101/drain
Access-log lines appear below, one per connection. Ctrl-C stops.

MSG
build-demo/sluice -c conf/sluice.toml
