"""The device-time model: instruction costs and the event-driven simulation behind `report`'s
estimate and `profile`."""
