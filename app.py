"""`python app.py`: start Vegas Studio from a clone (installed, the same is the `vegas-studio` command).
The layout and its wiring are in vegas_studio_app/ui.py."""
import sys

from vegas_studio_app.ui import main

if __name__ == "__main__":
    sys.exit(main())
