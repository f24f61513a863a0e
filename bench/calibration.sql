-- The machine's calibration: a one-row durable insert, the same in every bench script that
-- prints a calibration line (bench/lib.sh's bench_calibrate creates the table).
INSERT INTO calibration (v) VALUES (1);
