"""The journal of answers beside the output: appended, indexed, reused by a rerun."""
