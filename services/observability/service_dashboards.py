"""The dashboards of the services: the embedding store, the sampler, the control plane.

Part of :mod:`streamrec.observability.dashboards` (which registers and renders them); built
from :mod:`streamrec.observability.panels`.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from streamrec.observability.panels import (
    JOB,
    JOB_LABEL,
    NEUTRAL,
    Panel,
    board,
    increase,
    latency,
    leader,
    or_zero,
    quantile,
    rate,
    series,
    single,
)


def embedding_store() -> dashboard.Dashboard:
    """The parameter server: rows and memory (host and GPU), cache, latency, keys/s, shrink."""
    p = "streamrec_embedding_store"
    hits, misses = f"{p}_cache_hits_total", f"{p}_cache_misses_total"
    hit_rate = f"{rate(hits, 'table')} / ({rate(hits, 'table')} + {rate(misses, 'table')})"
    lowest_hit_rate = f"min({rate(hits, 'shard, table')} / ({rate(hits, 'shard, table')}" + (
        f" + {rate(misses, 'shard, table')}))"
    )
    gpu_share = f"max({p}_gpu_memory_used_bytes / {p}_gpu_memory_total_bytes)"
    panels: list[Panel] = [
        single(
            "Rows",
            "short",
            [(f"sum({p}_rows)", "rows")],
            "Rows over every shard and table.",
            NEUTRAL,
        ),
        single(
            "Memory used (resident / limit)",
            "percentunit",
            [(f"max({p}_resident_bytes / {p}_memory_limit_bytes)", "fullest shard")],
            "Resident memory of the fullest shard against its memory limit.",
            [(None, "green"), (0.8, "yellow"), (0.9, "red")],
        ),
        single(
            "GPU memory used",
            "percentunit",
            [(gpu_share, "fullest GPU")],
            "GPU memory in use on the fullest device-tier shard's GPU.",
            [(None, "green"), (0.8, "yellow"), (0.9, "red")],
            no_value="no shard on a GPU",
        ),
        single(
            "Cache hit rate",
            "percentunit",
            [(lowest_hit_rate, "lowest table")],
            "Lookups served from the RAM cache over the rate window (ssd tier), lowest over"
            " tables and shards.",
            [(None, "red"), (0.5, "yellow"), (0.8, "green")],
            no_value="no ssd-tier lookups",
        ),
        single(
            "Keys/s",
            "ops",
            [(f"{rate(f'{p}_pull_keys_total')} + {rate(f'{p}_push_keys_total')}", "keys/s")],
            "Keys pulled plus keys pushed per second, all shards.",
            NEUTRAL,
        ),
        series(
            "Rows per table and tier",
            "short",
            [(f"sum by (namespace, table, tier) ({p}_rows)", "{{namespace}} {{table}} {{tier}}")],
            "Rows held per job namespace, table and tier, summed over shards.",
            min_value=0,
        ),
        series(
            "Memory",
            "bytes",
            [
                (f"sum by (shard, tier) ({p}_tier_bytes)", "{{shard}} {{tier}} tier"),
                (f"sum by (shard) ({p}_resident_bytes)", "{{shard}} resident"),
                (f"sum by (shard) ({p}_memory_limit_bytes)", "{{shard}} limit"),
            ],
            "Bytes per tier, the process's resident memory, and the shard's memory limit.",
            min_value=0,
        ),
        series(
            "GPU memory and utilisation",
            "bytes",
            [
                (or_zero(f"sum by (shard) ({p}_gpu_memory_used_bytes)"), "{{shard}} used"),
                (or_zero(f"sum by (shard) ({p}_gpu_memory_allocated_bytes)"), "{{shard}} held"),
                (or_zero(f"sum by (shard) ({p}_gpu_memory_total_bytes)"), "{{shard}} total"),
                (
                    or_zero("max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576"),
                    "DCGM {{Hostname}} GPU {{gpu}} used",
                ),
            ],
            "Device-tier shards' GPU memory from torch.cuda (used by all processes, held by"
            " the shard, total), and DCGM's where its exporter runs (0: none).",
            min_value=0,
        ),
        series(
            "GPU busy",
            "percentunit",
            [
                (or_zero(f"max by (shard) ({p}_gpu_utilization_ratio)"), "{{shard}}"),
                (
                    or_zero("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL) / 100"),
                    "DCGM {{Hostname}} GPU {{gpu}}",
                ),
            ],
            "Share of time the device-tier shards' GPUs were busy (NVML), and DCGM's view.",
            min_value=0,
        ),
        series(
            "Cache hit rate",
            "percentunit",
            [(hit_rate, "{{table}}")],
            "Share of ssd-tier lookups served from RAM over the rate window, per table.",
            no_value="no ssd-tier lookups",
        ),
        series(
            "Keys/s",
            "ops",
            [
                (rate(f"{p}_pull_keys_total", "table"), "pull {{table}}"),
                (rate(f"{p}_push_keys_total", "table"), "push {{table}}"),
                (rate(f"{p}_optimizer_steps_total", "table"), "optimizer steps {{table}}"),
            ],
            "Keys pulled and pushed per second (and fused optimizer steps), per table.",
            min_value=0,
        ),
        series(
            "Pull latency",
            "s",
            latency(f"{p}_pull_seconds", "table"),
            "Time of a pull inside the store, per table.",
        ),
        series(
            "Push latency",
            "s",
            latency(f"{p}_push_seconds", "table"),
            "Time of a push (optimizer update) inside the store, per table.",
        ),
        series(
            "Request latency p99 by op",
            "s",
            [(quantile(0.99, f"{p}_request_seconds", "op"), "p99 {{op}}")],
            "Time to serve one request, by op.",
        ),
        series(
            "Request errors",
            "ops",
            [
                (
                    or_zero(rate(f"{p}_request_errors_total", "instance, op, code")),
                    "{{instance}} {{op}} {{code}}",
                )
            ],
            "Requests answered with an error, by shard, op and code.",
            min_value=0,
        ),
        series(
            "Shrink and admission",
            "ops",
            [
                (rate(f"{p}_rows_deleted_total", "table"), "deleted {{table}}"),
                (rate(f"{p}_rows_created_total", "table"), "created {{table}}"),
                (rate(f"{p}_rows_refused_total", "table"), "refused {{table}}"),
            ],
            "Rows deleted (every reason), created by first use, refused by admission, per second.",
            min_value=0,
        ),
        series(
            "Rows deleted by reason",
            "ops",
            [
                (
                    rate(f"{p}_rows_deleted_total", "table, reason"),
                    "{{reason}} {{table}}",
                ),
            ],
            "Rows deleted per second by table and reason: shrink (the day-end shrink), erase,"
            " delta_load (a loaded delta's deletes), namespace_drop (a job's namespace"
            " dropped). The next delta carries each deleted key to serving.",
            min_value=0,
        ),
        series(
            "Live rows per table",
            "short",
            [(f"sum by (table) ({p}_table_rows)", "{{table}}")],
            "Rows each table holds now, every shard and tier together.",
            min_value=0,
        ),
        series(
            "Checkpoint events",
            "none",
            [
                (or_zero(increase(f"{p}_save_seconds_count", "mode")), "save {{mode}}"),
                (increase(f"{p}_load_seconds_count"), "load"),
            ],
            "Saves by mode (checkpoint, base, delta, batch) and loads per rate window.",
            min_value=0,
        ),
        series(
            "Save and load time p99",
            "s",
            [
                (or_zero(quantile(0.99, f"{p}_save_seconds", "mode")), "save {{mode}}"),
                (or_zero(quantile(0.99, f"{p}_load_seconds")), "load"),
            ],
            "Time to save, by mode, and to load (buckets to 6 h; 0 until the first).",
        ),
    ]
    return board(
        "streamrec-embedding-store",
        "StreamRec / Embedding store",
        "Rows per table and tier, host and GPU memory, cache hit rate, pull/push latency and"
        " keys/s, errors, rows deleted by reason and live rows per table, and checkpoints.",
        False,
        panels,
    )


def sampler() -> dashboard.Dashboard:
    """The node-local negative sampler, one series per node: throughput, latency, errors."""
    p = "streamrec_sampler"
    served = 'op!="reload"'
    panels: list[Panel] = [
        single(
            "Negatives/s",
            "ops",
            [(rate(f"{p}_negatives_sampled_total"), "negatives/s")],
            "Negative ids returned per second, all samplers.",
            NEUTRAL,
        ),
        single(
            "Request latency p99 (slowest node)",
            "s",
            [(f"max({quantile(0.99, f'{p}_request_seconds', 'instance', served)})", "p99")],
            "99th percentile of the time to serve a request on the slowest node (the table"
            " reload, seconds by nature, apart).",
            [(None, "green"), (0.02, "yellow"), (0.05, "red")],
        ),
        single(
            "Table rows",
            "short",
            [(f"min({p}_table_rows)", "rows")],
            "Rows of the loaded negative table (the node with the fewest).",
            NEUTRAL,
        ),
        single(
            "Error share",
            "percentunit",
            [
                (
                    or_zero(rate(f"{p}_errors_total")) + f" / {rate(f'{p}_requests_total')}",
                    "errors",
                )
            ],
            "Share of requests answered with an error, all nodes.",
            [(None, "green"), (0.001, "yellow"), (0.01, "red")],
        ),
        series(
            "Negatives/s",
            "ops",
            [
                (rate(f"{p}_negatives_sampled_total", "instance"), "sampled {{instance}}"),
                (rate(f"{p}_unfilled_negatives_total", "instance"), "unfilled {{instance}}"),
            ],
            "Negative ids returned per node, and slots left to missing_id (category unknown or"
            " small).",
            min_value=0,
        ),
        series(
            "Requests/s by op",
            "ops",
            [(rate(f"{p}_requests_total", "instance, op"), "{{instance}} {{op}}")],
            "Requests served per second, per node and op.",
            min_value=0,
        ),
        series(
            "Request latency",
            "s",
            latency(f"{p}_request_seconds", "instance, op", served),
            "Time to serve a request, p50 and p99 per node and op (reloads apart).",
        ),
        series(
            "Errors/s",
            "ops",
            [
                (
                    or_zero(rate(f"{p}_errors_total", "instance, op, code")),
                    "{{instance}} {{op}} {{code}}",
                )
            ],
            "Requests answered with an error, per node, op and code.",
            min_value=0,
        ),
        series(
            "Table size",
            "short",
            [
                (f"max by (instance) ({p}_table_rows)", "rows {{instance}}"),
                (f"max by (instance) ({p}_table_categories)", "categories {{instance}}"),
            ],
            "Rows and categories of each node's loaded negative table.",
            min_value=0,
        ),
        series(
            "Table reloads",
            "none",
            [(increase(f"{p}_reloads_total", "instance"), "{{instance}}")],
            "Tables loaded successfully per rate window, per node.",
            min_value=0,
        ),
        series(
            "Table reload time p99",
            "s",
            [(quantile(0.99, f"{p}_reload_seconds", "instance"), "{{instance}}")],
            "Time to validate and build a negative table, per node (buckets to 6 h).",
        ),
    ]
    return board(
        "streamrec-sampler",
        "StreamRec / Sampler",
        "Negatives/s, request latency by op, negative table size, errors; one series per node.",
        False,
        panels,
    )


def control_plane() -> dashboard.Dashboard:
    """The REST API and its scheduler: requests, Redis, the trainer pool, queues, heartbeats."""
    j = JOB_LABEL
    p = "streamrec_api"
    panels: list[Panel] = [
        single(
            "Redis up",
            "bool",
            [(f"min({p}_redis_up)", "redis")],
            "1 when every API's last Redis call (scheduler tick) succeeded.",
            [(None, "red"), (1, "green")],
        ),
        single(
            "Scheduler leaders",
            "short",
            [(f"sum({p}_scheduler_leader)", "leaders")],
            "APIs holding the scheduler lease: 1 expected (0: nothing is scheduled).",
            [(None, "red"), (1, "green"), (2, "red")],
        ),
        single(
            "5xx rate",
            "percentunit",
            [
                (
                    or_zero(rate(f"{p}_requests_total", selector='status=~"5.."'))
                    + f" / {rate(f'{p}_requests_total')}",
                    "5xx share",
                )
            ],
            "Share of requests answered with a server error.",
            [(None, "green"), (0.01, "yellow"), (0.05, "red")],
        ),
        single(
            "Jobs waiting for trainers",
            "short",
            [(or_zero(f"max({leader(f'{p}_jobs_waiting_for_trainers')})"), "jobs")],
            "Running jobs that no trainer group serves (the pool is busy or has no group of"
            " the job's size).",
            [(None, "green"), (1, "yellow")],
        ),
        single(
            "Oldest trainer heartbeat",
            "s",
            [(or_zero(f"max({leader(f'{p}_trainer_heartbeat_age_seconds{{{JOB}}}')})"), "age")],
            "Seconds since the quietest served job's trainer group sent a heartbeat.",
            [(None, "green"), (30, "yellow"), (60, "red")],
        ),
        series(
            "Trainer pool",
            "short",
            [
                (f"max by (state) ({leader(f'{p}_pool_groups')})", "groups {{state}}"),
                (f"max({leader(f'{p}_jobs_waiting_for_trainers')})", "jobs waiting"),
                (
                    f"max({leader(f'{p}_pool_groups_held_by_ended_jobs')})",
                    "groups held by an ended job",
                ),
            ],
            "Trainer groups registered in the pool, idle or busy, running jobs waiting for"
            " one, and groups that still name a job that has ended (counted idle).",
            min_value=0,
        ),
        series(
            "Requests/s by route and status",
            "reqps",
            [(rate(f"{p}_requests_total", "route, status"), "{{route}} {{status}}")],
            "HTTP requests per second by route template and status.",
            min_value=0,
        ),
        series(
            "Errors/s",
            "ops",
            [
                (or_zero(rate(f"{p}_requests_total", "route", 'status=~"5.."')), "5xx {{route}}"),
                (or_zero(rate(f"{p}_requests_total", "route", 'status=~"4.."')), "4xx {{route}}"),
                (rate(f"{p}_redis_errors_total"), "redis errors"),
            ],
            "Server errors and client errors by route, and failed Redis calls.",
            min_value=0,
        ),
        series(
            "Request latency",
            "s",
            latency(f"{p}_request_seconds", "route"),
            "HTTP request latency, p50 and p99 by route.",
        ),
        series(
            "Redis up and scheduler leader",
            "short",
            [
                (f"min({p}_redis_up)", "redis up"),
                (f"sum({p}_scheduler_leader)", "leaders"),
            ],
            "Whether Redis answers, and how many APIs hold the scheduler lease.",
            min_value=0,
        ),
        series(
            "Work queue depth",
            "short",
            [
                (
                    or_zero(f"max by ({j}) ({leader(f'{p}_work_queue_depth{{{JOB}}}')})"),
                    f"{{{{{j}}}}}",
                )
            ],
            "Passes handed out but not yet taken by a trainer group.",
            min_value=0,
        ),
        series(
            "Jobs by state",
            "short",
            [(f"max by (state) ({leader(f'{p}_jobs')})", "{{state}}")],
            "Jobs per state.",
            min_value=0,
        ),
        series(
            "Passes handed out and requeued",
            "none",
            [
                (increase(f"{p}_passes_handed_out_total", j, JOB), f"handed out {{{{{j}}}}}"),
                (increase(f"{p}_passes_requeued_total", j, JOB), f"requeued {{{{{j}}}}}"),
            ],
            "Passes per rate window put on a job's work stream, and handed out again.",
            min_value=0,
        ),
        series(
            "Trainer heartbeats",
            "s",
            [
                (
                    or_zero(
                        f"max by ({j}) ({leader(f'{p}_trainer_heartbeat_age_seconds{{{JOB}}}')})"
                    ),
                    f"heartbeat age {{{{{j}}}}}",
                ),
                (
                    or_zero(
                        f"max by ({j}) ({leader(f'{p}_trainer_progress_age_seconds{{{JOB}}}')})"
                    ),
                    f"progress age {{{{{j}}}}}",
                ),
            ],
            "Seconds since each served job's trainer group sent a heartbeat / made progress.",
            min_value=0,
        ),
        series(
            "Trainer groups dead and restarted",
            "none",
            [
                (increase(f"{p}_trainer_groups_dead_total", j, JOB), f"dead {{{{{j}}}}}"),
                (increase(f"{p}_group_restarts_total", j, JOB), f"restarted {{{{{j}}}}}"),
            ],
            "Trainer groups found dead (heartbeat expired with a pass in flight), and"
            " infrastructure restarts of a job's group.",
            min_value=0,
        ),
        series(
            "Scheduler tick latency",
            "s",
            latency(f"{p}_scheduler_tick_seconds"),
            "Duration of one scheduler tick, p50 and p99.",
        ),
        series(
            "Triggers",
            "none",
            [(increase(f"{p}_triggers_total", "kind, state"), "{{kind}} {{state}}")],
            "Trigger outcomes per rate window, by kind and state.",
            min_value=0,
        ),
        series(
            "Targets up",
            "short",
            [('sum by (job) (up{job=~"streamrec-.*"})', "{{job}}")],
            "Scrape targets answering, per service (idle trainer ranks of the pool answer too).",
            min_value=0,
        ),
    ]
    return board(
        "streamrec-control-plane",
        "StreamRec / Control plane",
        "Requests, errors, Redis, the trainer pool, work queues, requeues, trainer heartbeats,"
        " scheduler.",
        True,
        panels,
    )
