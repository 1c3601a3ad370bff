-- idempo 0.2.0 -> 0.3.0.
-- Released install scripts are frozen: every schema change after a release goes into the next
-- version's install script AND into an upgrade script like this one, so that ALTER EXTENSION
-- idempo UPDATE leaves a database with exactly the objects of a fresh install (test/upgrade/run
-- compares the two).  Same rules as the install script: every object schema-qualified,
-- operators written OPERATOR(pg_catalog.x).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit
