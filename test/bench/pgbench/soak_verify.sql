-- soak: settle the three oldest unknown attempts (verify).
SELECT soak_verify();
