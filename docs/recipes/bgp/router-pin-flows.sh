#!/bin/sh
# On a Linux router that runs BIRD: keeps every flow to the service address
# on the instance its first packet went to. BIRD installs a plain multipath
# route, which the kernel hashes with hash-threshold: when an instance's
# route is withdrawn or comes back, part of the *other* instances' flows move
# too, and each moved flow is reset by an instance that has no socket for
# it. Resilient nexthop groups would keep them, but BIRD 2 does not install
# those. Connection tracking does: a new flow follows the multipath route,
# its connection is marked with the interface it left by, and its later
# packets follow that mark to the same instance whatever BIRD changes.
# A flow to an instance that died is lost either way (it was that
# instance's session).
set -eu
VIP=10.0.100.1

nft -f - <<NFT
table ip sluice_pin {
  chain prerouting {
    type filter hook prerouting priority mangle; policy accept;
    ip daddr $VIP ct mark != 0 meta mark set ct mark
  }
  chain postrouting {
    type filter hook postrouting priority mangle; policy accept;
    ip daddr $VIP ct mark 0 oifname "ri1" ct mark set 1
    ip daddr $VIP ct mark 0 oifname "ri2" ct mark set 2
    ip daddr $VIP ct mark 0 oifname "ri3" ct mark set 3
  }
}
NFT

for k in 1 2 3; do
  ip route replace "$VIP/32" via "10.0.$k.2" dev "ri$k" table $((100 + k))
  ip rule add fwmark "$k" to "$VIP/32" lookup $((100 + k)) priority 100
done
