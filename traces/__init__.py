"""Request traces as JSONL: loader with validation, converters from public formats, slicing tools."""
