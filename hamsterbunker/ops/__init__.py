"""What operators and their tools use: status, the history checker, provisioning,
configuration, the client that hands work in, local node processes."""
