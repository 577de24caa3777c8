"""Support every layer may use: optional-dependency messages and progress output."""
