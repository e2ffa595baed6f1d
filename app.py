"""`python app.py`: start Vegas Studio from a clone (installed, the same is the `vegas-studio` command).
The layout and its wiring are in vegas_studio_app/ui.py."""
import sys

if __name__ == "__main__":
    # Imported here: the engine's process (`engine_process`, spawned) loads this file again, and
    # needs none of the server.
    from vegas_studio_app.ui import main
    sys.exit(main())
