"""What every store kept in a directory shares (the file backend, the syncdir store, the
earlier file layout's reader): bounded file and directory I/O (``fileio``), where a store
directory may lie (``location``), and the lease file's watch (``lease_watch``)."""
