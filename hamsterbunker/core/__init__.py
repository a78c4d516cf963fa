"""What every part shares: errors, limits and read bounds, clocks and timing, blobs,
state JSON, a node's own durable files, failpoints, logging, the history recorder."""
