"""The one error `tpuserve up` reports and exits on."""


class UpError(Exception):
    """A problem `tpuserve up` reports and exits on (message names the flag or process)."""
