"""Host glue: everything between a raw observation and the sessions, and back (host_glue.md)."""
