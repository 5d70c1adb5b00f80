"""Step time and bytes on paper: the alpha-beta step model and the scripts that feed and extrapolate it."""
