"""The examples' TensorFlow start drops the CUDA probe's lines and nothing else."""

from example_support.quiet_start import probe_lines_dropped

HEADER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = "I0000 00:00:1.1 1 port.cc:153] oneDNN custom operations are on. You may see slightly different ...\n"
NO_DRIVER = "I0000 00:00:1.2 1 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\n"
CUINIT = ("E0000 00:00:1.3 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to "
          "cuInit: UNKNOWN ERROR (303)\n")
FACTORY = "E0000 00:00:1.4 1 cuda_fft.cc:467] Unable to register cuFFT factory: Attempting to register factory\n"
OTHER_ERROR = "E0000 00:00:1.5 1 some_kernel.cc:10] something else went wrong\n"


def test_probe_lines_go_and_everything_else_stays_in_order():
    text = HEADER + ONEDNN + NO_DRIVER + CUINIT + FACTORY + OTHER_ERROR + "Traceback (most recent call last):\n"
    assert probe_lines_dropped(text) == HEADER + ONEDNN + OTHER_ERROR + "Traceback (most recent call last):\n"


def test_a_header_left_alone_goes_too():
    assert probe_lines_dropped(HEADER + NO_DRIVER + "\n" + CUINIT) == ""
    assert probe_lines_dropped("") == ""
