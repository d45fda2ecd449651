"""Pure in-memory building blocks of the worker: no Django, no psycopg, no I/O.

Nothing here reads a clock or starts a thread; time is passed in as floats.
Modules: ``hashing`` (key → shard, queue → lane, CRC16 slots), ``heap``
(indexed priority queues), ``skiplist`` (delayed-job index), ``lru``,
``fifoset``, ``rwlock``, ``breaker`` and ``localqueue`` (the worker's local
sharded queue). Import the module you need; this package imports nothing.
"""
