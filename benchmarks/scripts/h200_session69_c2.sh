#!/usr/bin/env bash
# Session 69 call 2 (carry .whl; ~3 min): KdaConfig.early_ticket in its relaxed one-lane atom.inc form
# (the KDA tests of the ticket on CUDA), then plain decode (the table) and early_ticket plain + relay
# (its speculative == plain check); the relay does not run this mode (verify stages), so no table relay.
KDA_TESTS="early or ticket or persistent" KDA_TEST_LIMIT=60 RELAY_TABLE=0 \
    exec bash "$(dirname "$0")/h200_session69_c1_lean.sh"
