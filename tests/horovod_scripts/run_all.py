"""Run the scripts named on the command line one after another in this process: one ``horovodrun`` job
(one TensorFlow start per rank) for all of them. Each script is also runnable alone."""

import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
for script in sys.argv[1:]:
    sys.argv = [script]
    runpy.run_path(os.path.join(here, script), run_name="__main__")
