-- The machine's calibration: a one-row durable insert, the same on every bench script.
INSERT INTO ceil_calibration (v) VALUES (1);
