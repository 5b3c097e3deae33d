"""Fuzzing: property tests of every decoder and adapter, the proxy fuzzer, config limits."""
