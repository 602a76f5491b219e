"""The SQL store. Importing it registers every table on `models.Base.metadata`."""

from . import batches, files, keys, models  # noqa: F401 - each module adds its tables
