"""Exception types. The CLI turns every `GpuwiseError` into one line on stderr and exit code 2."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): what a one-line report quotes."""
    return (str(exc).strip().splitlines() or [""])[0]


class GpuwiseError(Exception):
    """Bad input or an expected failure: the message is shown to the user as one line."""


class WorkloadError(GpuwiseError):
    """A workload file, module or example that cannot be loaded or does not follow the contract."""


class DeviceError(GpuwiseError):
    """GPU discovery, selection or reservation cannot do what was asked."""


class NoGpuError(DeviceError):
    """There is no GPU to choose from (none found, or CUDA_VISIBLE_DEVICES hides them all)."""


class CudaAlreadyInitialized(DeviceError):
    """CUDA_VISIBLE_DEVICES was to be changed after CUDA had already been initialised in this process."""
