#!/usr/bin/env bash
# Session 46 call 4 (an H100 was lent; carry .whl, .triton_cache.tar.gz): session 41's call 4
# (the KDA prefill's segmented walks against the table) without its test file, which passed
# whole in call 3.
TAG=s46_c4 SKIP_TEST_FILE=1 exec bash "$(dirname "$0")/h200_session41_c4.sh"
