"""Where a table's rows live: one :class:`~.table_tier.TableTier` interface, its tiers and
their helpers.

- ``table_tier``: :class:`TableTier` (the interface every tier implements), ``table_params``,
  the save selections.
- ``host_table`` (:class:`HostTable`, rows in RAM; ``prefault`` maps its memory ahead),
  ``ssd_table``, ``ssd_cache`` and ``ssd_file`` (:class:`SsdTable`: rows in a file, a CLOCK RAM
  cache in front), ``device_table`` (:class:`DeviceTable`: every row in GPU memory; ``device_rows``,
  ``device_staging``, ``device_block``), ``cached_table`` (:class:`CachedTable`: a host or ssd
  table's hot rows cached on a GPU).
- ``cuda_lib`` and ``cuda_ext``: the CUDA kernels' library (its build and its ctypes binding).

Tiers import nothing of persistence, the service or the store above them (import contract
``store-layers``).
"""
