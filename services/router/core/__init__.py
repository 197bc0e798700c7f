"""Pure routing logic: candidate workers, bookings, and one file per policy."""
