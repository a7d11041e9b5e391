"""English (every ``en`` locale): instants to the second with the time zone's name, dates
as ISO 8601 (Django's letters: https://docs.djangoproject.com/en/5.2/ref/templates/builtins/#date)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
