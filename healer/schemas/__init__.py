"""Wire formats: the pydantic models are the single source of every document healer sends.

Import the submodules (``from healer.schemas import telemetry``); ``codec`` decodes bytes from the bus
into these models and is the only place untyped data is allowed.
"""
