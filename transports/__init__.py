"""Transports move frames and report peer events; they know nothing of request states."""
