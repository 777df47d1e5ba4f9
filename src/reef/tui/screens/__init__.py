"""The review's screens: the tab panes of the main screen, detail screens, and dialogs."""
