#!/bin/sh
# The fault-injection proxy checks itself: its own record and result digests against
# every golden vector, and each fault mode against a local upstream.
exec python3 tests/faultproxy_selftest.py tests/vectors/golden-vectors.json
