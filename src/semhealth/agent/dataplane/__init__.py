"""The data plane: accept, relay bytes, note each chunk's arrival time, hand copies to
analysis. Nothing here waits on analysis."""
