"""The pending sweep: a scheduled job that fails knowledge sources pending for over an hour."""
