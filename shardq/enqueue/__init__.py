"""The enqueue path beside the backend (``shardq/backend.py``, which reads
as enqueue, enqueue_many, get_result, cancel and check): what a call must be
(``arguments``), the row it becomes (``rows``), the TaskResults
(``results``), unique tasks (``unique``) and graphs of jobs (``graph``).
Their statements are ``shardq/db/enqueue.py``'s and ``shardq/db/sql/``'s."""
