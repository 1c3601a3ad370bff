-- soak: a reviewer decides up to five open reviews and dismisses up to five open conflicts.
SELECT soak_review();
