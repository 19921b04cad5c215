"""Running cells on Ray: a worker per cell (`worker`), and the driver that schedules and gates (`driver`)."""
