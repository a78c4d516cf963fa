"""What every part shares: errors, limits and read bounds, clocks and timing, blobs,
state JSON, failpoints, logging, the history recorder."""
