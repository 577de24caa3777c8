# the real wheel ships an empty package marker here too
