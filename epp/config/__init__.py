"""EndpointPickerConfig YAML → validated plugins and profiles."""
