"""llmgw's own date formats (``FORMAT_MODULE_PATH``): the admin shows instants as
"2026-12-04 18:47:12 UTC" wherever Django formats one itself (list columns and read-only
fields of ``DateTimeField``s), the way ``catalog.admin.instant`` does in computed columns."""
