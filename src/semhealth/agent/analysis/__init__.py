"""The analysis plane: everything that is not forwarding, in a process of its own."""
