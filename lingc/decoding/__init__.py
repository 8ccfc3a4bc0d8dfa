"""Reference decode loops: greedy, sampling and NEXTN speculative decoding, in plain Python."""
